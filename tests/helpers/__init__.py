"""Helpers shared by volfsm's test suites."""
