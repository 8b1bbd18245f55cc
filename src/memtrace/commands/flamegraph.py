import click


@click.command("flamegraph")
def x(): pass
command = x
