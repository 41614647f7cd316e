"""The step-time model's old path: it lives in compiler/cost/step_time.py. Kept only while compiler/search.py (being
split into a package) imports `Simulator` and `links` from here; delete this file once it imports the new path."""
import sys

from compiler.cost import step_time

sys.modules[__name__] = step_time  # the very module, not a copy: one set of globals, whichever path imported it
