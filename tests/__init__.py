"""Tests that span the package: real engines, servers and installs."""
