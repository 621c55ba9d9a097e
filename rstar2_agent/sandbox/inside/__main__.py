"""Starts the sandbox's program: `python -I -S <this folder> MODE SCRATCH`. Running a folder puts it first on
sys.path; its modules are imported as the package they are instead (by the folder's name, from the folder above,
searched last so that nothing there shadows the standard library), and the path is left as -I -S made it."""

import os
import sys

_here = sys.path.pop(0)
sys.path.append(os.path.dirname(_here))
control = __import__(os.path.basename(_here) + ".control", fromlist=["main"])
sys.path.pop()
control.main()
