"""dsa-tvm: deploy trained models to a domain-specific AI accelerator with Apache TVM."""

__version__ = "0.1.0"
