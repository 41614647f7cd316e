"""The .scale grammar (scale.lark), shipped as package data so an installed scalec finds it."""
from pathlib import Path

GRAMMAR_PATH = Path(__file__).with_name("scale.lark")
