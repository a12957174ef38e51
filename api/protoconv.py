"""Re-encoding between versions of one kubelet protocol (v1beta1 and v1 of DRA or its health
service): the versions differ only by fields one side lacks, so a message converts through the
wire format."""

from typing import TypeVar

from google.protobuf.message import Message

_M = TypeVar("_M", bound=Message)


def convert(message: Message, target: type[_M]) -> _M:
    """Re-read ``message`` as ``target``, dropping fields ``target`` does not know."""
    out = target.FromString(message.SerializeToString())
    out.DiscardUnknownFields()
    return out
