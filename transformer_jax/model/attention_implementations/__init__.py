"""How softmax(Q K^T / sqrt(d_k)) V (Sec. 3.2.1) is computed in training and encoding:
one module here for each value of model.attention_implementation, which registers a
subclass of model.attention.Implementation with `transformer_jax.config.ATTENTION`
under its own name (`xla`, `cudnn`; docs/extending.md adds one). model/attention.py
dispatches the config's name to it in one place.
"""
