"""Stage 1, the graph: capture a model (torch.export), make a private normalised copy, read what each node is.

Also the graph runner the stages share (with observers), the pass contract both graph-changing stages use, the
captured model (``captured.py``) that compile, the configurator, search and debug share, and how a program is called.
"""
