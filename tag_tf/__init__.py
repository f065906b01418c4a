"""tag_tf: TAG for TensorFlow graphs. `tag_tf.distribute` trains existing TF1 code distributed."""
from tag_tf.frontend.distribute import distribute

__all__ = ["distribute"]
