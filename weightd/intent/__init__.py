"""Fleet intent (design §15): desired state declared in files, reconciled on this node.

``spec``: the intent files (``[[keep]]`` entries, node selectors, windows); ``forecast``: the load
history and the seasonal forecaster behind prewarming; ``nfd``: what this node holds, as Node Feature
Discovery labels; ``reconcile``: desired against actual, with the reason for every difference.
"""
