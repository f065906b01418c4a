"""Measurements on real TensorFlow runtimes: traced op times, transfers and all-reduces, the links of a
running cluster. What they measure feeds the models of `tag_tf.profile`."""
