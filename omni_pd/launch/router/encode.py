"""The encoder pre-leg (E in E -> P -> D) on the router's :class:`~.core.PreLeg` seam.

:class:`EncodeLeg` sends one request per media item of a chat request to the ``encoder``
pool at once (bodies from :func:`omni_pd.launch.epd.encoder_request_bodies`), and hands
P/D the client's body with E's ``ec_transfer_params`` merged in
(:func:`omni_pd.launch.epd.merge_ec_params`). A request without media skips E. Picking,
balancing, health skipping, retry and cancellation are the router's; an E failure is the
router's 502 naming the leg (``encoder``) and the backend; the other items' legs are
cancelled. Enabled by ``--encoder URL`` (repeatable) on ``python -m omni_pd.launch.router``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from omni_pd.launch import epd
from omni_pd.launch.router.core import LegContext, PreLeg

log = logging.getLogger("omni_pd.router")


class EncodeLeg(PreLeg):
    """One encoder request per media item, concurrently; see the module doc."""

    role = "encoder"

    async def apply(self, ctx: LegContext, body: dict[str, Any]) -> dict[str, Any]:
        items = epd.encoder_request_bodies(body)
        if not items:
            return body
        tasks = [asyncio.create_task(ctx.call_json(self.role, ctx.path, item)) for item in items]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:  # first failure (a LegError: the router's 502) or the client left
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        answers = [answer for _, answer in results]
        missing = epd.missing_params(answers)
        if missing:
            log.warning("rid=%s %d of %d encoder answers carried no ec_transfer_params; the consumer "
                        "encodes those items itself", ctx.request_id, missing, len(answers))
        return epd.merge_ec_params(body, answers)
