"""rstar2_agent.train (lives in the top-level train/ folder)."""
