import logging

logger = logging.getLogger("omni.provider")
