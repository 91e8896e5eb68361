"""The node suite: `pytest tests/node --hosts=ansible://all --ansible-inventory=INVENTORY`.

Helpers live in nodehelpers.py (imported by the test modules, found through this folder).
"""
