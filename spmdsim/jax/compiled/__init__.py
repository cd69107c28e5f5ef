"""The faster form of the evaluation: each jaxpr compiled to one Python function per executor kind
(``_compiled``), with runs of elementwise equations done block by block (``_fusion``); tested equal to the
interpreter loop. Imports the rules and everything below; only the integration imports it."""
