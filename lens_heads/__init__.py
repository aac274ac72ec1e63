"""lens_heads: find, test and repair dormant attention heads, on TransformerLens."""

from lens_heads.errors import LensHeadsError
from lens_heads.models import ARCHITECTURES, ZOO, HeadGeometry, LoadedModel, load_model

__version__ = "0.1.0"
__all__ = ["ARCHITECTURES", "ZOO", "HeadGeometry", "LensHeadsError", "LoadedModel", "load_model"]

from lens_heads.scores import SCORES, HeadScores, score_heads  # noqa: E402

__all__ += ["SCORES", "HeadScores", "score_heads"]
