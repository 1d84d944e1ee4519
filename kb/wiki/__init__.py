"""The wiki: the git repository, its files and checks, the agent, its playbook and its room."""
