"""rstar2_agent.chat (lives in the top-level chat/ folder): `rstar2 chat`, a terminal chat with the agent.

conversation.py keeps the chat as the model saw it, token for token; terminal.py renders it with rich and runs the
terminal loop and `-p`.
"""
