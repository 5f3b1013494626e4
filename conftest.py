# Lets tests import the problem's modules (reference, task, utils, eval) from the repository root.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
