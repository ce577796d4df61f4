"""The TACCL stages, one module each, that turn a sketch into a verified schedule.

A sketch (``stages.sketch``) opens a logical graph (``logical``); routings send each chunk
along a tree of its links (the MILP in ``routing``, spanning-tree packing in ``tree_packing``,
machine-by-machine routes in ``hierarchy``); ``ordering`` orders the sends on every link,
``scheduling`` joins consecutive sends into transfers, and ``lower_schedule`` lowers the result to
an ``Algorithm``. ``taccl_py.synth`` walks these stages over candidate chunkings; the packed-trees
baseline (``taccl_py.baselines.packing``) builds with them too, which is why they sit below both.
"""
