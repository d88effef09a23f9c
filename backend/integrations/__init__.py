"""Framework adapters (optional extras): strata as a LangChain or LlamaIndex retriever.

``backend.integrations.langchain.StrataRetriever`` needs
``pip install 'strata-rag[langchain]'``; ``backend.integrations.llamaindex.StrataRetriever``
needs ``pip install 'strata-rag[llamaindex]'``. Both run a registered
retriever (strata's ``auto_merge`` by default, see ``backend.rag.registry``)
and return the framework's own document types with strata's metadata and the
meta record under ``META_KEY``. This package itself imports neither framework.
"""

from backend.integrations._common import META_KEY

__all__ = ["META_KEY"]
