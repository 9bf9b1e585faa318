"""Schemas of the built-in model plug-ins (``ffn``, ``resnet``, ``lstm``): torch-free, read on the laptop."""
