"""How an image of one size becomes an image of the training size: the resize policies, as arithmetic.

Pure functions of the image's size, the target size and the policy; the
decoder (:mod:`daskstream.sources.images.codec`) asks them what to request
from a JPEG decoder's scaled decoding, which region of the decoded image to
resample and where the result sits in the target.

Sizes here are ``(width, height)``, as Pillow takes them, except ``target``,
which is ``(height, width)`` as the array axes run and as a user passes
``size=``.
"""

from __future__ import annotations

from dataclasses import dataclass

from daskstream.errors import InvalidArgumentError

#: The resize policies :func:`daskstream.open_images` takes.
RESIZE_POLICIES = ("stretch", "crop", "pad")


@dataclass(frozen=True)
class Resize:
    """One image's way to the target size.

    Attributes
    ----------
    box
        ``(left, upper, right, lower)``: the region of the image that is
        resampled, in its pixels (fractions allowed: Pillow's ``resize(box=)``
        resamples sub-pixel regions without rounding them first).
    size
        ``(width, height)`` the region is resampled to.
    offset
        ``(x, y)`` where the resampled region's top-left corner sits in the
        target; the rest of the target is padding (zeros).
    """

    box: tuple[float, float, float, float]
    size: tuple[int, int]
    offset: tuple[int, int]


def check_resize_policy(policy: str) -> str:
    """``policy`` when it is one of :data:`RESIZE_POLICIES`, else an :class:`InvalidArgumentError`."""
    if policy not in RESIZE_POLICIES:
        raise InvalidArgumentError(f"resize={policy!r}: use one of {', '.join(map(repr, RESIZE_POLICIES))}")
    return policy


def plan_resize(width: int, height: int, target: tuple[int, int], policy: str) -> Resize:
    """The :class:`Resize` that takes an image of ``width`` x ``height`` pixels to ``target`` = (height, width).

    ``"stretch"`` resamples the whole image to the target, whatever its aspect
    ratio; ``"crop"`` resamples the largest centred region of the target's
    aspect ratio (the image scaled to cover the target, its overhang cut off
    equally on both sides); ``"pad"`` resamples the whole image to the largest
    size of its own aspect ratio that fits the target, centred, the margins
    left as padding. The regions and sizes are those of Pillow's
    ``ImageOps.fit`` and ``ImageOps.pad`` (centred), so the same resample
    gives the same pixels.

    >>> plan_resize(400, 300, (224, 224), "stretch")
    Resize(box=(0.0, 0.0, 400.0, 300.0), size=(224, 224), offset=(0, 0))
    >>> plan_resize(400, 300, (224, 224), "crop")
    Resize(box=(50.0, 0.0, 350.0, 300.0), size=(224, 224), offset=(0, 0))
    >>> plan_resize(400, 300, (224, 224), "pad")
    Resize(box=(0.0, 0.0, 400.0, 300.0), size=(224, 168), offset=(0, 28))
    """
    out_h, out_w = target
    whole = (0.0, 0.0, float(width), float(height))
    if policy == "stretch":
        return Resize(whole, (out_w, out_h), (0, 0))
    if policy == "crop":
        image_ratio, target_ratio = width / height, out_w / out_h
        keep_w, keep_h = float(width), float(height)
        if image_ratio > target_ratio:
            keep_w = target_ratio * height  # wider than the target: the sides are cut off
        elif image_ratio < target_ratio:
            keep_h = width / target_ratio
        left, upper = (width - keep_w) * 0.5, (height - keep_h) * 0.5
        return Resize((left, upper, left + keep_w, upper + keep_h), (out_w, out_h), (0, 0))
    check_resize_policy(policy)
    fit_w, fit_h = fitted_size(width, height, target)
    # round(), as ImageOps.pad places it: an odd margin leaves its extra pixel on the even side.
    return Resize(whole, (fit_w, fit_h), (round((out_w - fit_w) * 0.5), round((out_h - fit_h) * 0.5)))


def fitted_size(width: int, height: int, target: tuple[int, int]) -> tuple[int, int]:
    """``(width, height)`` of the image scaled, aspect ratio kept, to the largest size that fits ``target``.

    At least one pixel each way, however thin the image.

    >>> fitted_size(400, 300, (224, 224)), fitted_size(10, 1000, (64, 64))
    ((224, 168), (1, 64))
    """
    out_h, out_w = target
    image_ratio, target_ratio = width / height, out_w / out_h
    if image_ratio > target_ratio:
        return out_w, max(1, round(height / width * out_w))
    if image_ratio < target_ratio:
        return max(1, round(width / height * out_h)), out_h
    return out_w, out_h


def decode_at_least(
    width: int, height: int, target: tuple[int, int], policy: str, quality: str = "accurate"
) -> tuple[int, int]:
    """``(width, height)`` a scaled JPEG decoding must keep the image at, at least, for ``policy``'s resample.

    A JPEG decoder can decode at 1/2, 1/4 or 1/8 scale for a fraction of the
    work (DCT scaling, Pillow's ``Image.draft``); the resample that follows
    then starts from at least as many pixels as it produces, in each
    direction, so it still only shrinks. For ``"stretch"`` and ``"crop"`` that
    is the target itself: a cropped region of an image at least the target's
    size in both directions is too. For ``"pad"``, the fitted size.

    ``quality="fast"`` keeps half of that in each direction (rounded up):
    the decode may then have down to half the lines the target has, which
    the resample stretches, for fewer pixels decoded; detail finer than half
    the target's resolution is lost, as a resample without antialiasing
    loses it to aliasing.

    >>> decode_at_least(1024, 768, (224, 224), "crop"), decode_at_least(1024, 768, (224, 224), "pad")
    ((224, 224), (224, 168))
    >>> decode_at_least(1024, 768, (224, 224), "crop", "fast")
    (112, 112)
    """
    out_h, out_w = target
    wanted = fitted_size(width, height, target) if policy == "pad" else (out_w, out_h)
    if quality == "fast":
        return -(-wanted[0] // 2), -(-wanted[1] // 2)
    return wanted


QUALITIES = ("accurate", "fast")

__all__ = [
    "QUALITIES",
    "RESIZE_POLICIES",
    "Resize",
    "check_resize_policy",
    "decode_at_least",
    "fitted_size",
    "plan_resize",
]
