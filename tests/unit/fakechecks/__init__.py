"""Fake checks that follow the check contract without any GPU: the engine's tests run them.

They live in importable modules because the engine starts their ranks in child processes
(the worker imports a check by its module name; a launcher runs ``python -m``).
"""
