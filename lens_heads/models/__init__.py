from lens_heads.models.geometry import ARCHITECTURES, HeadGeometry
from lens_heads.models.load import LoadedModel, check_device, load_model
from lens_heads.models.zoo import ZOO

__all__ = ["ARCHITECTURES", "HeadGeometry", "LoadedModel", "ZOO", "check_device", "load_model"]
