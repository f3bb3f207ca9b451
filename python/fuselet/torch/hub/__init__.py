"""fuselet's layers as a local kernel repository of the `kernels` package (the layout its
LocalLayerRepository loads: build/<variant>/ with metadata.json and the package), for
transformers' `use_kernels=True` / `model.kernelize()`. Build the mapping with
fuselet.torch.transformers.kernel_mapping() or kernel_config()."""
