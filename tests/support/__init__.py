"""Helpers the tests import: clients, deployments, reliability checks, request corpora, stage classes."""
