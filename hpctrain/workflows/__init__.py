"""Workflows that join the two sides: a training run submitted and followed through ``hpctrain.submission``, then
the trained model used on this machine through the allocation side's domain code (``hpctrain.ffn``). The CLI
(``hpctrain.commands``) parses, calls one function here and prints; the domain packages never reach up.
"""
