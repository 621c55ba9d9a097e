"""rstar2_agent.eval (lives in the top-level eval/ folder)."""
