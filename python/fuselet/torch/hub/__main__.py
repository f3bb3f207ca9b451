"""Write each build variant's metadata.json, with the digest of its files that the kernels
package verifies at load: python python/fuselet/torch/hub/__main__.py (or python -m
fuselet.torch.hub where fuselet is installed)."""

import json
import pathlib

from kernels._rust import Digest, DigestAlgorithm

for backend in ("cpu", "cuda"):
    variant = pathlib.Path(__file__).parent / f"torch-{backend}"
    meta = {
        "name": "fuselet",
        "id": f"_fuselet_hub_torch_{backend}",
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": backend},
        "digest": {"algorithm": "sha256", "files": Digest.hash_variant(DigestAlgorithm.SHA256, variant).files},
    }
    (variant / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"wrote {variant / 'metadata.json'}")
