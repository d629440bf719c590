"""Your own TensorFlow command on this project's machinery: TFJob's TF_CONFIG, restarts, cleanup, publishing."""
