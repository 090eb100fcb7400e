"""The public Python API: ``functions`` (prune, distil, measure, export inside your own code) and
the argument ``checks`` it runs at each call. ``import compress`` re-exports the public names."""
