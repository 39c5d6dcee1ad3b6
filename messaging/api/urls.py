"""/api/v1/: the server API (mounted by config.urls, with the push seed's POST /messages beside it).

Every view is mounted through `pooled`: on a web node (ASGI) Django runs all sync views on one
thread, one request at a time, so each send would wait for the previous one's commit (an fsync) and
a node would do one commit's worth of sends at a time. On the node's database pool
(foundation.asyncdb) requests run side by side, and Postgres flushes their commits together.
"""

from __future__ import annotations

from django.urls import path, re_path

from foundation.asyncdb import pooled
from messaging.api import exchange_views, operator, request_views, views
from messaging.api.errors import not_found


def _endpoint(route: str, view_class: type[views.ApiView], name: str):
    return path(route, pooled(view_class.as_view()), name=name)


urlpatterns = [
    _endpoint("messages", views.MessagesView, "api-messages"),
    _endpoint("messages/batch", views.MessagesBatchView, "api-messages-batch"),
    _endpoint("messages/<str:message_id>", views.MessageDetailView, "api-message"),
    _endpoint("channels/<str:channel>/messages", views.ChannelMessagesView, "api-channel-messages"),
    _endpoint("channels/<str:channel>/subscribers", views.ChannelSubscribersView, "api-channel-subscribers"),
    _endpoint("channels/<str:channel>/subscribers/<str:user_id>", views.ChannelSubscriberView,
              "api-channel-subscriber"),
    _endpoint("channels/<str:channel>/members", views.ChannelMembersView, "api-channel-members"),
    _endpoint("users/<str:user_id>/subscriptions", views.UserSubscriptionsView, "api-user-subscriptions"),
    _endpoint("users/<str:user_id>/follows/<str:target_id>", views.UserFollowView, "api-user-follow"),
    _endpoint("presence/online", views.OnlineUsersView, "api-presence-online"),
    _endpoint("users/<str:user_id>/presence", views.UserPresenceView, "api-user-presence"),
    _endpoint("users/<str:user_id>/disconnect", views.UserDisconnectView, "api-user-disconnect"),
    _endpoint("dead-letters", views.DeadLettersView, "api-dead-letters"),
    _endpoint("dead-letters/requeue", views.DeadLettersRequeueView, "api-dead-letters-requeue"),
    _endpoint("dead-letters/discard", views.DeadLettersDiscardView, "api-dead-letters-discard"),
    _endpoint("users/<str:user_id>/requests", request_views.UserRequestsView, "api-user-requests"),
    _endpoint("requests/<str:request_id>", request_views.RequestDetailView, "api-request"),
    _endpoint("requests/<str:request_id>/resolve", request_views.RequestResolveView, "api-request-resolve"),
    _endpoint("requests/<str:request_id>/reject", request_views.RequestRejectView, "api-request-reject"),
    _endpoint("events", exchange_views.EventsView, "api-events"),
    _endpoint("exchange/users/<str:n>/followers", exchange_views.FollowersView, "api-exchange-followers"),
    _endpoint("exchange/users/<str:n>/followees", exchange_views.FolloweesView, "api-exchange-followees"),
    path("operator/selftest", pooled(operator.SelftestView.as_view()), name="api-operator-selftest"),
    path("operator/selftest/<str:name>", pooled(operator.SelftestRunView.as_view()), name="api-operator-selftest-run"),
    re_path(r"^.*$", not_found, name="api-not-found"),
]
