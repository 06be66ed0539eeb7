"""MCP servers as toolsets (--mcp_config): their configuration (servers.py), a client session with one
(connection.py), and their tools as the registry and a sample's session hold them (toolsets.py)."""
