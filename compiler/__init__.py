"""scalec: compile a .scale training plan into a torch.distributed program."""

__version__ = "0.1.0"
