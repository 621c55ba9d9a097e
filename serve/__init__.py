"""rstar2_agent.serve (lives in the top-level serve/ folder)."""
