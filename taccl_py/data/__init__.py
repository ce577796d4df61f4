"""Package data: the built-in machines (``taccl_py.data.topologies``) and the shipped algorithm
libraries (``taccl_py.data.algorithms``).

Both live at the top of the source tree (``topologies/``, ``algorithms/``); pyproject.toml maps them
onto these package names so that a wheel carries them and ``importlib.resources`` finds them in an
installed and in an editable package alike.
"""
