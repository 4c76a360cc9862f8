//! The JSON codec of the query API (Connect's JSON for `querier.v1`) on untrusted bytes: never
//! panics, and what it accepts writes back out and reads again as the same message, in JSON and
//! in binary protobuf.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use smolder_common::querier::{
    DiffRequest, LabelNamesRequest, LabelValuesRequest, SelectMergeProfileRequest,
    SelectMergeSpanProfileRequest, SelectMergeStacktracesRequest, SelectSeriesRequest,
    SeriesRequest,
};

fn check<M>(data: &[u8])
where
    M: Message + Default + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let Ok(message) = serde_json::from_slice::<M>(data) else {
        return;
    };
    let json = serde_json::to_vec(&message).expect("a read message writes");
    let again: M = serde_json::from_slice(&json).expect("what is written reads");
    // NaN steps are not equal to themselves; compare their binary forms instead.
    assert_eq!(again.encode_to_vec(), message.encode_to_vec());
    let binary = M::decode(&message.encode_to_vec()[..]).expect("own encoding decodes");
    assert_eq!(binary.encode_to_vec(), message.encode_to_vec());
}

fuzz_target!(|data: &[u8]| {
    check::<SelectMergeStacktracesRequest>(data);
    check::<SelectMergeProfileRequest>(data);
    check::<SelectMergeSpanProfileRequest>(data);
    check::<SelectSeriesRequest>(data);
    check::<DiffRequest>(data);
    check::<SeriesRequest>(data);
    check::<LabelNamesRequest>(data);
    check::<LabelValuesRequest>(data);
});
