"""Expert-parallel copies (issue 40): a local object holding the non-expert tensors of a mixture of
experts and only one expert-parallel rank's routed experts, repacked into shards of the same names.

By concern::

    plan.py     the split (vLLM's linear expert placement), the copy's manifest made from the version's
    repack.py   writing the copy from a source directory, every tensor checked as it is written
"""
