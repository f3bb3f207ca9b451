"""fuselet's layers as a local kernel repository of the `kernels` package, for transformers'
`use_kernels=True` / `model.set_use_kernels(True)`: the layout kernels' LocalLayerRepository
loads, a directory per build variant (torch-cpu, torch-cuda), each with its metadata.json and a
package whose `layers` are fuselet.torch.hub.layers. Register the mapping with
fuselet.torch.transformers.register_kernels() (kernel_mapping() builds it), or on a GPU
take kernel_config()."""
