"""Images built on this machine: no registry is needed, and none is used.

A plugin binary that fakelet already builds from the Go module proxy (static:
CGO off) becomes an image `FROM scratch` holding the binary as its entrypoint
and an empty /tmp, built with testcontainers' `DockerImage` and tagged by the
binary's content (`fakelet.local/<name>:<sha256 prefix>`), so a rebuild of the
same binary is a no-op and a changed one gets a new tag.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from testcontainers.core.image import DockerImage

from harness.instruments.progress import Progress
from harness.launch.containers import engine
from harness.launch.owners import PREFIX

BUILD_QUIET_S = 2.0  # a scratch image of one binary takes about a second; a loaded engine takes longer
PULL_QUIET_S = 2.0  # a pull the engine refuses at once says nothing beyond the caller's error
REPOSITORY = "fakelet.local"  # no registry has this name: these images never leave the engine
DOCKERFILE = """\
FROM scratch
COPY rootfs/ /
COPY {name} /{name}
ENTRYPOINT ["/{name}"]
"""


class ImageError(RuntimeError):
    """The image could not be built; the message says why."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:12]


def tag_for(binary: Path, name: str) -> str:
    return f"{REPOSITORY}/{name}:{_digest(binary)}"


def exists(tag: str) -> bool:
    from docker.errors import ImageNotFound

    found = engine.client()
    try:
        found.images.get(tag)
        return True
    except ImageNotFound:
        return False
    finally:
        found.close()


def scratch_image(binary: Path | str, name: str | None = None) -> str:
    """The tag of an image whose entrypoint is `binary` (a static executable); built when missing."""
    binary = Path(binary)
    if not binary.is_file():
        raise ImageError(f"no binary at {binary}")
    name = name or binary.name
    tag = tag_for(binary, name)
    if exists(tag):
        return tag
    from docker.errors import BuildError, DockerException

    with tempfile.TemporaryDirectory(prefix=f"{PREFIX}image-") as ctx:
        context = Path(ctx)
        # /tmp: plugins write scratch files there (the upstream sample plugin does, on Allocate).
        (context / "rootfs" / "tmp").mkdir(parents=True, mode=0o1777)
        (context / "rootfs" / "tmp").chmod(0o1777)
        shutil.copy2(binary, context / name)
        (context / "Dockerfile").write_text(DOCKERFILE.format(name=name))
        engine.prepare_testcontainers()
        image = DockerImage(path=context, tag=tag, clean_up=False,
                            docker_client_kw={"timeout": int(engine.API_TIMEOUT_S)})
        try:
            with Progress(tag, doing="building image", done="built image", quiet_s=BUILD_QUIET_S,
                          detail=f" from {binary} (first use; kept in the Docker engine)"):
                image.build()
        except (BuildError, DockerException) as err:
            raise ImageError(f"cannot build {tag}: {err}") from err
        finally:
            image.get_docker_client().client.close()
    return tag


def ensure_present(image: str) -> None:
    """The image is in the engine, pulled if the engine can pull it; an ImageError naming it otherwise."""
    from docker.errors import DockerException, ImageNotFound

    found = engine.client()
    try:
        found.images.get(image)
    except ImageNotFound:
        try:
            with Progress(image, doing="pulling image", done="pulled image", quiet_s=PULL_QUIET_S,
                          detail=f" into the Docker engine at {engine.host()} (first use; kept there)"):
                found.images.pull(image)
        except DockerException as err:
            said = str(getattr(err, "explanation", None) or err).splitlines()[0]
            raise ImageError(f"image {image} is not in the Docker engine at {engine.host()} and cannot be pulled "
                             f"({said[-200:]})") from None
    finally:
        found.close()
