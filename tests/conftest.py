import torch

# Tests run tiny networks on a 2-core machine shared with the physics threads:
# torch's own thread pool only adds contention there.
torch.set_num_threads(1)
