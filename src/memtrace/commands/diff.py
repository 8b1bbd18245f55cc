import click
@click.command("diff")
def x(): pass
command = x
