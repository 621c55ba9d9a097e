"""The program that runs inside the sandbox, standard library only, started as `python -I -S <this folder> MODE
SCRATCH` (`__main__.py`). Layered bottom up: frames.py (the control channel and its protocol), process.py (limits,
descriptors, the cleanup after a call), program.py (running the user's code, capturing its output), the two modes
(fork_mode.py: the stateless tool, a fork a call from a template that never holds a call's bytes; session_mode.py:
the stateful tool, one kernel whose namespace persists across cells), control.py (process setup, the request loop).
"""
