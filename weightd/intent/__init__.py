"""Fleet intent (design §15): desired state declared in files, reconciled on this node.

``spec``: the ``[[keep]]`` entries and their checks; ``selector`` and ``window``: an entry's node
selector and transfer window; ``files``: reading the intent directory and the node labels file
safely; ``forecast``: the load history and the seasonal forecaster behind prewarming; ``nfd``: what
this node holds, as Node Feature Discovery labels; ``reconcile``: desired against actual, with the
reason for every difference.
"""
