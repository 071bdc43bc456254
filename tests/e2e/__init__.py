"""End-to-end tests: a real LiveKit server, the omni worker and the agent (see conftest.py)."""
