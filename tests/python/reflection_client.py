#!/usr/bin/env python3
"""A polyglot client of agent-harness that knows nothing but the server's address.

It uses only grpcio and grpcio-reflection (plus grpcio-status to read error details): no
generated stubs, no .proto files. Everything it needs it learns over server reflection, the way
an engineer's ad-hoc script would.

    reflection_client.py HOST:PORT

Checks, in order, exiting non-zero with a clear message at the first failure:
  1. reflection lists the harness services and health;
  2. TranslateChannelMessage, with message classes built from the reflected descriptors,
     turns two images and a document into two links and one skip;
  3. an AgentSessionService error carries a google.rpc.ErrorInfo in the `agent-harness` domain.
"""

import os
import sys
import tempfile
import time

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.rpc import error_details_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_status import rpc_status

EXPECTED_SERVICES = [
    "agent_harness.v1.AgentSessionService",
    "agent_harness.v1.ChannelTranslatorService",
    "agent_harness.v1.RuntimeGatewayService",
    "grpc.health.v1.Health",
]
BASE_URL = "https://static.example"
ERROR_DOMAIN = "agent-harness"
TIMEOUT_S = 10


class CheckFailed(Exception):
    pass


def check(condition, message):
    if not condition:
        raise CheckFailed(message)


def unary(channel, pool, full_method):
    """A callable for `package.Service.Method`, with classes built from reflected descriptors."""
    method = pool.FindMethodByName(full_method)
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    path = "/{}/{}".format(method.containing_service.full_name, method.name)
    call = channel.unary_unary(
        path,
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    return request_class, call


def uuid7():
    """A UUID version 7 string (Python 3.11's uuid module has none)."""
    millis = int(time.time() * 1000)
    raw = bytearray(millis.to_bytes(6, "big") + os.urandom(10))
    raw[6] = (raw[6] & 0x0F) | 0x70
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return "{}-{}-{}-{}-{}".format(h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def check_services(database):
    services = set(database.get_services())
    print("reflection lists: {}".format(", ".join(sorted(services))))
    missing = [s for s in EXPECTED_SERVICES if s not in services]
    check(not missing, "reflection does not list {}".format(missing))


def check_translate(channel, pool):
    request_class, translate = unary(
        channel, pool, "agent_harness.v1.ChannelTranslatorService.TranslateChannelMessage"
    )
    request = request_class()
    request.message.message_id = "m-1"
    request.message.channel_id = "c-1"
    request.message.content = "what is wrong here?"
    for entity_type, entity_id in [
        ("static/image", "img-1"),
        ("document", "doc-1"),
        ("static/image", "img-2"),
    ]:
        attachment = request.message.attachments.add()
        attachment.entity_type = entity_type
        attachment.entity_id = entity_id

    reply = translate(request, timeout=TIMEOUT_S)
    check(
        reply.prompt.prompt == "what is wrong here?",
        "prompt text is {!r}".format(reply.prompt.prompt),
    )
    got = [(a.uri, a.name, a.mime_type, a.HasField("size")) for a in reply.prompt.attachments]
    want = [
        (BASE_URL + "/file/img-1", "image", "image/*", False),
        (BASE_URL + "/file/img-2", "image", "image/*", False),
    ]
    check(got == want, "attachments are {}, expected {}".format(got, want))
    check(len(reply.skipped) == 1, "skipped is {}".format(list(reply.skipped)))
    skipped = reply.skipped[0]
    reason_enum = skipped.DESCRIPTOR.fields_by_name["reason"].enum_type
    reason = reason_enum.values_by_number[skipped.reason].name
    check(
        (skipped.index, skipped.entity_type, reason)
        == (1, "document", "SKIP_REASON_UNSUPPORTED_TYPE"),
        "skipped[0] is {} {} {}".format(skipped.index, skipped.entity_type, reason),
    )
    print("TranslateChannelMessage: 2 attachments, 1 skipped ({}) as expected".format(reason))


def check_error_details(channel, pool):
    request_class, get_session = unary(
        channel, pool, "agent_harness.v1.AgentSessionService.GetSession"
    )
    request = request_class(session_id=uuid7())
    try:
        get_session(request, timeout=TIMEOUT_S)
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        check(
            status is not None,
            "GetSession failed with {} but no grpc-status-details-bin trailer".format(
                error.code()
            ),
        )
        infos = []
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                infos.append(info)
        check(infos, "GetSession error details hold no google.rpc.ErrorInfo")
        info = infos[0]
        check(
            info.domain == ERROR_DOMAIN,
            "ErrorInfo domain is {!r}, expected {!r}".format(info.domain, ERROR_DOMAIN),
        )
        # SESSION_NOT_FOUND once sessions exist; UNIMPLEMENTED while the service is being built.
        expected = {
            grpc.StatusCode.NOT_FOUND: "SESSION_NOT_FOUND",
            grpc.StatusCode.UNIMPLEMENTED: "UNIMPLEMENTED",
        }
        check(
            expected.get(error.code()) == info.reason,
            "GetSession of an unknown session: {} with reason {!r}".format(
                error.code(), info.reason
            ),
        )
        print(
            "GetSession error: {} with ErrorInfo {{reason: {}, domain: {}}}".format(
                error.code().name, info.reason, info.domain
            )
        )
        return
    raise CheckFailed("GetSession of an unknown session succeeded")


def check_large_transcript(channel, pool):
    """6 MiB of agent output reads completely through GetTranscript paging under the default
    4 MiB message limit of this client (issue 13, item 4)."""
    service = "agent_harness.v1.AgentSessionService."
    create_class, create = unary(channel, pool, service + "CreateSession")
    control_class, control = unary(channel, pool, service + "Control")
    get_class, get_session = unary(channel, pool, service + "GetSession")
    page_class, get_transcript = unary(channel, pool, service + "GetTranscript")
    queue_class, get_queue = unary(channel, pool, service + "GetQueue")
    # A directory of its own: the agent works there, in its box (the file system root holds
    # the server's own files, so it is no session's cwd).
    workdir = tempfile.mkdtemp(prefix="reflection-client-")
    created = create(create_class(profile="mock", cwd=workdir), timeout=TIMEOUT_S)
    session_id = created.session.id
    for _ in range(3):
        request = control_class(session_id=session_id)
        request.prompt.prompt = "@long 2000000"
        control(request, timeout=TIMEOUT_S)
    # Wait for the three turns (queued behind each other) to end: IDLE with three agent turns.
    deadline = time.time() + 60
    while True:
        session = get_session(get_class(session_id=session_id), timeout=TIMEOUT_S).session
        status = session.DESCRIPTOR.fields_by_name["status"].enum_type.values_by_number[
            session.status
        ].name
        queued = get_queue(queue_class(session_id=session_id), timeout=TIMEOUT_S).entries
        if status == "SESSION_STATUS_IDLE" and not queued:
            break
        check(time.time() < deadline, "the three long turns did not end: {}".format(status))
        time.sleep(0.1)
    total, pages, token = 0, 0, ""
    while True:
        page = get_transcript(
            page_class(session_id=session_id, page_token=token), timeout=TIMEOUT_S
        )
        pages += 1
        for message in page.messages:
            for part in message.parts:
                if part.WhichOneof("kind") == "text":
                    total += len(part.text.text)
        if not page.next_page_token:
            break
        token = page.next_page_token
    check(total >= 6_000_000, "GetTranscript returned {} bytes of text, not 6 MB".format(total))
    print("GetTranscript: {} bytes of agent text in {} pages".format(total, pages))


def main(argv):
    if len(argv) != 2:
        print("usage: reflection_client.py HOST:PORT", file=sys.stderr)
        return 2
    target = argv[1]
    with grpc.insecure_channel(target) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
            database = ProtoReflectionDescriptorDatabase(channel)
            pool = descriptor_pool.DescriptorPool(database)
            check_services(database)
            check_translate(channel, pool)
            check_error_details(channel, pool)
            check_large_transcript(channel, pool)
        except CheckFailed as failure:
            print("python reflection client: FAILED: {}".format(failure), file=sys.stderr)
            return 1
        except grpc.FutureTimeoutError:
            print("python reflection client: FAILED: no connection to {}".format(target),
                  file=sys.stderr)
            return 1
        except grpc.RpcError as error:
            print("python reflection client: FAILED: unexpected {}: {}".format(
                error.code(), error.details()), file=sys.stderr)
            return 1
    print("python reflection client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
