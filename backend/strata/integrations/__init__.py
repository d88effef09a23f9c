"""Framework adapters (optional extras): strata as a LangChain or LlamaIndex retriever.

``strata.integrations.langchain.StrataRetriever`` needs
``pip install 'strata-rag[langchain]'``; ``strata.integrations.llamaindex.StrataRetriever``
needs ``pip install 'strata-rag[llamaindex]'``. Both run a registered
retriever (strata's ``auto_merge`` by default, see ``strata.rag.registry``)
and return the framework's own document types with strata's metadata and the
meta record under ``META_KEY``. This package itself imports neither framework.
"""

from strata.integrations._common import META_KEY

__all__ = ["META_KEY"]
