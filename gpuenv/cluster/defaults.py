"""The defaults of a `gpuenv cluster` run, owned here: the pipeline's Options and the CLI's
options read them (standard library only, so that building the CLI's parser imports nothing
else of the cluster runner)."""

MIB = 1 << 20
DEADLINE_S = 300.0  # each node's command and each launch
PORT = 29400  # the rendezvous port on the first node; pair runs use the next ones
SIZES = (MIB, 8 * MIB, 64 * MIB)  # all-reduce sizes across nodes
PAIR_BYTES = 64 * MIB  # all-reduce size of each pair test
MATRIX_MAX_NODES = 8  # the full pair matrix up to this many nodes
ITERS = 5  # timed all-reduces per size
STEPS = 5  # DDP training steps
# How long a node gets to answer the first probe, however long the launch deadline.
PROBE_DEADLINE_S = 30.0
