"""Hostile: truncates every memfd it inherited, the release flag the GPU hold polls among them, and makes
the judge start a new worker (restarts_its_worker), which writes that flag as it starts: a flag that
could be shrunk would fault there (SIGBUS) and take the judge down. Its answers are the reference's."""
from reference import ref_kernel
from restarts_its_worker import arm
from truncates_the_shared_memory import _truncate_everything

arm()


def custom_kernel(data):
    out = ref_kernel(data).clone()
    _truncate_everything()
    return out
