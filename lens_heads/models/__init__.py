from lens_heads.models.geometry import ARCHITECTURES, HeadGeometry
from lens_heads.models.load import LoadedModel, load_model
from lens_heads.models.zoo import ZOO

__all__ = ["ARCHITECTURES", "HeadGeometry", "LoadedModel", "ZOO", "load_model"]
