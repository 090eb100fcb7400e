"""Foundation: what every other layer stands on and that knows nothing about models.

Errors, typed configs and their checks, safe loading of files, run folders and checkpoints,
torch.distributed helpers, the training-hook interface, and the version. Imports only the standard
library, numpy, torch and ``compress.core`` itself."""
