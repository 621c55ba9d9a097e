"""rstar2-agent: an open rStar2-Agent."""

__version__ = "0.1.0"
