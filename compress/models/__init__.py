"""Models: finding and loading an encoder (packaged default, local folder, run folder, hub name),
the role table of each encoder family (which modules are attention, feed-forward, embeddings), and
the modeling code that lets structured-pruned folders load with the transformers Auto classes."""
