"""What ops and transfers cost: op profiles and their fit, the analytical GPU cost model, communication
models, the grouping weights and the profile database (`tag_tf.measure` takes the measurements)."""
