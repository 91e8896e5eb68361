"""Offline bundles: a signed apt repository and a wheel folder for a pins file (docs/sources.md)."""
